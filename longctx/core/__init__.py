"""The floor every stage stands on: errors, hashing, number tests, the scaling-model maths and how a list reads.

Nothing here knows an engine, a file layout or a stage; every other package may import it.
"""
