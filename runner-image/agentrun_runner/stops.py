"""The runner's own ways of ending an attempt on purpose, before a call that must not be
made now: a call waits for a human's approval, a limit of spec.limits is reached.

ADK records an exception of the agent as an error event in the session (wrapped, when a
plugin raised it). Such a stop is not the conversation's: the session service keeps that
event out of the journal, which then ends where it stood (a pending call, a tool's
response) and can be resumed from there once the call may be made.
"""

from __future__ import annotations


class AttemptStop(RuntimeError):
    """The attempt ends on purpose, with the journal intact."""
