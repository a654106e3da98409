"""The floor every stage stands on: errors, hashing, number tests and the scaling-model maths.

Nothing here knows an engine, a file layout or a stage; every other package may import it.
"""
