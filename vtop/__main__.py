from vtop.cli import main

raise SystemExit(main())
