"""``python -m loadline`` runs the CLI."""

from loadline.cli import main

raise SystemExit(main())
