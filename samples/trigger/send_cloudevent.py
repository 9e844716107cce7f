"""Sends one CloudEvent to a trigger, as a sender would: made and encoded by CloudEvents' own
Python SDK (pip install cloudevents; `make venv` has it), in binary mode, or structured mode
with --structured, with a bearer token.

    python3 samples/trigger/send_cloudevent.py TRIGGER TOKEN [--id ticket-1001] [--structured]

It reads the trigger's status.url with kubectl (the current namespace, or -n) and trusts
the development cluster's receiver CA (.local/receiver/ca.crt; --cacert for another).
Sending the same --id again is answered 200 "duplicate", with the run's name.
"""

from __future__ import annotations

import argparse
import json
import ssl
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

from cloudevents.core.bindings import http
from cloudevents.core.v1.event import CloudEvent

CA = Path(__file__).resolve().parents[2] / ".local" / "receiver" / "ca.crt"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("trigger")
    p.add_argument("token")
    p.add_argument("--id", default="ticket-1001", help="the event's id (its identity)")
    p.add_argument("--source", default="/helpdesk/tickets")
    p.add_argument("--structured", action="store_true", help="structured mode")
    p.add_argument("-n", "--namespace", default="")
    p.add_argument("--cacert", type=Path, default=CA)
    a = p.parse_args()
    url = subprocess.run(
        ["kubectl", "get", "agentruntrigger", a.trigger, "-o", "jsonpath={.status.url}",
         *(["-n", a.namespace] if a.namespace else [])],
        check=True, capture_output=True, text=True).stdout.strip()
    if not url:
        print(f"AgentRunTrigger {a.trigger} has no status.url yet: is the operator running "
              "(make run)?", file=sys.stderr)
        return 1
    event = CloudEvent({"id": a.id, "source": a.source, "type": "com.example.ticket.opened",
                        "datacontenttype": "application/json"},
                       {"ticket": 1001, "subject": "Refund for order 42"})
    message = http.to_structured_event(event) if a.structured else http.to_binary_event(event)
    request = urllib.request.Request(url, data=message.body, method="POST", headers={
        **message.headers, "Authorization": f"Bearer {a.token}"})
    context = ssl.create_default_context(cafile=str(a.cacert))
    try:
        with urllib.request.urlopen(request, context=context, timeout=30) as response:
            print(response.status, json.loads(response.read()))
    except urllib.error.HTTPError as e:
        print(e.code, json.loads(e.read() or b"{}"))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
