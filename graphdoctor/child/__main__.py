"""`python -m graphdoctor.child SPEC.json`: one isolated diff or count child run."""

from graphdoctor.child.entry import main

if __name__ == "__main__":
    main()
