"""python -m ezra"""

from .app import main

if __name__ == "__main__":
    main()
