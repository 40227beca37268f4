"""`python -m memcpy_doctor` is the `memcpy-doctor` command."""

from .cli import main

if __name__ == "__main__":
    main()
