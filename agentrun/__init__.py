"""agentrun: what the operator and the runner share — the vocabulary and the run store."""
