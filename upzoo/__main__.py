"""``python -m upzoo`` is the ``upzoo`` command (also what torchrun launches)."""

from upzoo.cli import main

if __name__ == "__main__":
    main()
