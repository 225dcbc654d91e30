"""``python -m sim plan ...``: see sim.planning.cli."""
import sys

from sim.planning.cli import main

if __name__ == "__main__":  # importing the module (a torch-free check does) runs nothing
    sys.exit(main())
