"""`kubectl agentrun console`: runs, transcripts, approvals, schedules, triggers and cost in
a browser, served on 127.0.0.1 by the plugin with the user's own identity (server.py; who
may reach it: guard.py; what each page shows: views.py; the pages: static/, built from
kubectl-plugin/console by `make console`)."""
