"""`python -m aitune.torch.jit script.py [args]`: run a script with JIT tuning on."""

from aitune_jit.launcher import main

raise SystemExit(main())
