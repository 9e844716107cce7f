"""The store API: the run store as runner pods may see it, and nothing more.

Runner pods hold no database credential. Each presents a projected ServiceAccount token
with the store's own audience (vocabulary.STORE_AUDIENCE); the API verifies it with a
TokenReview, follows the pod it is bound to (its labels and its controller, an AgentRun)
to one attempt of one run, and checks in the store that this attempt is the pod's and is
still live. Everything a request may touch is derived from that attempt; nothing in a
request names another run, session, namespace or ledger row:

- its input snapshot (read);
- its own ADK session (create, read, append events; never delete);
- its ledger (append a call before the tool runs, close its own open calls; never
  delete or rewrite a row);
- long-term memory of its (namespace, agent, user);
- the sample agents' outbox (the "world" of the sample tools), stamped with the run;
- its outcome.

A token of a settled attempt, of a deleted pod, of another audience, or of a pod that is
not an agentrun runner is refused with a message that says why. The database pool lives
here, capped (every runner was once a client of its own; now none is).

The modules, by concern:

- `auth`: from a request's token to the one live attempt it speaks for (TokenReview,
  the pod, the store), or a refusal;
- `routes`: what a runner may do, one handler per route, and the table of routes; what a
  runner may say (its outcome's reason, a call answered from the journal);
- `limits`: every number that bounds what one runner may ask (pool, caches, bodies,
  quotas), with its reason;
- `quotas`: what one attempt has written and may still write, and its turn at the store;
- `refusal`: a request refused, as the runner is told (a status and one sentence);
- `app`: the aiohttp application, and `serve()`;
- `main`: the program `agentrun-store-api` (the chart's own Deployment, and `make run`'s
  second process beside the operator on the development cluster);
- `metrics`: what it exports on `--metrics-port`;
- `transcripts`, `frontproxy`, `access`: the transcript API (store.agentrun.dev, an
  aggregated API on its own listener, `--transcript-listen`): what it serves, who the
  API server's front proxy says the user is, and whether the API server lets them
  (SubjectAccessReview). Users, not runners: it shares nothing with the routes above but
  the store.

Nothing here imports kopf or the operator's package: the store API's image carries only
this package and the shared `agentrun`.
"""
