"""`kubectl agentrun`: replay a run, see which tools it called, and why a replay was decided;
cancel a run in place; start a schedule's run now.

    kubectl agentrun replay RUN [--force] [--note TEXT] [--name NAME]
    kubectl agentrun approve RUN [--deny] [--note TEXT]
    kubectl agentrun tools RUN
    kubectl agentrun why REPLAY
    kubectl agentrun cancel RUN [--note TEXT]
    kubectl agentrun schedule trigger SCHEDULE
    kubectl agentrun result RUN [-o json]
    kubectl agentrun transcript RUN [-f] [--uid UID]
    kubectl agentrun history [-A] [--since 24h] [--phase Failed] [-l SELECTOR]

Installed as the console script `kubectl-agentrun`; kubectl finds it on PATH. It talks to
the cluster as kubectl does (KUBECONFIG / --kubeconfig, --context, or in-cluster), in the
namespace given by -n/--namespace or else the context's. `tools` shows the ledger the
operator publishes on a settled run (status.toolCalls): no database credential is
needed. With DATABASE_URL (or --database-url) it reads the run store instead, which also
shows the calls of a run still going. `result` and `transcript` read the run's Transcript
through the API server (the aggregated API store.agentrun.dev, which the store API serves):
the user's own kubeconfig and RBAC (agentrun-view) are all they need. `history` lists
the run archive (runs.store.agentrun.dev) the same way: every run the store recorded,
including those deleted from the API server after their time to live.

Exit codes: 0 done (replay approved); 1 refused (by the operator or by the API server);
2 usage or connection errors, or no decision in time.
"""
