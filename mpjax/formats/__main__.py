"""`python -m mpjax.formats`: print every registered format with its facts."""

from mpjax.formats import facts_table

if __name__ == "__main__":
    print(facts_table())
