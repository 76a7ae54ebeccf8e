"""python -m ezra: the same program as the `ezra` command."""

from .tools.entry import main

if __name__ == "__main__":
    main()
