"""Functions of the runner image that an Agent may name as tools (`{function:
sample_tools.refund_policy}`): the declarative sample's. Not an agent directory: a module
beside them, importable because the runner puts the agents directory on its path for
Agents' functions. Only the functions marked by agentrun.effects' decorators are tools;
`order_of`, a helper, is not, and an Agent naming it is refused (docs/agents.md)."""

from __future__ import annotations

from agentrun import effects

# Orders of the sample's customers and whether each is refundable.
_ORDERS = {"42": {"order": "42", "refundable": True, "within_days": 30},
           "43": {"order": "43", "refundable": False, "within_days": 0}}


def order_of(order: str) -> dict:
    """The order's record (a helper of refund_policy, not a tool)."""
    return _ORDERS.get(order) or {"order": order, "refundable": False,
                                  "reason": "no such order"}


@effects.read_only
def refund_policy(order: str) -> dict:
    """Whether an order may be refunded, and within how many days of delivery."""
    return order_of(order)
