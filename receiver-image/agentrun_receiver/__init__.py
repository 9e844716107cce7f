"""agentrun-receiver: the trigger receiver. Each AgentRunTrigger is served at
/v1/triggers/<namespace>/<name>; an event delivered there starts the trigger's run once,
however often it is delivered (docs/triggers.md)."""
