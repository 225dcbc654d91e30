"""``python -m sim plan ...``: see sim.cli."""
import sys

from sim.cli import main

if __name__ == "__main__":  # importing the module (a torch-free check does) runs nothing
    sys.exit(main())
