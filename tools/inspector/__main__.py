"""``python -m tools.inspector`` (``make demo``): the window inspector."""

from tools.inspector.inspector import main

raise SystemExit(main())
