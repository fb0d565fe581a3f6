from llmd.cli import main

raise SystemExit(main())
