"""The store API's serving certificate: agentrun.tls, which the trigger receiver serves
with too."""

from agentrun.tls import RELOAD_SECONDS, ServingCertificate

__all__ = ["RELOAD_SECONDS", "ServingCertificate"]
