"""The program inside a runner pod: one attempt of one AgentRun, run with ADK.

`agentrun-runner` (or `python -m agentrun_runner`) reads the run identity from the
environment (vocabulary.RunnerEnv), refuses to start without a durable store, runs the
agent with a write-ahead tool ledger, history compaction and side-effect-safe model
retries, writes its outcome to the run store and exits with a vocabulary.RunnerExit code.
"""
