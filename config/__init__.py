"""Stack settings: pydantic models of every config key, the rules across sections, AWS facts with
their sources, resource names. The base of every other package; imports nothing of theirs."""
