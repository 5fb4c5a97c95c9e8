from attnkit.cli import main

raise SystemExit(main())
