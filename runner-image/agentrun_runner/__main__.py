"""`python -m agentrun_runner`."""

from agentrun_runner.main import main

raise SystemExit(main())
