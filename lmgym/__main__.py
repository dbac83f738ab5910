from lmgym.cli import main

raise SystemExit(main())
