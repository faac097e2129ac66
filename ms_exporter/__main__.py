"""`python -m ms_exporter` is the `ms-exporter` command."""

from ms_exporter.cli import main

raise SystemExit(main())
