"""g2c-grader: grade notebooks for the course's linear-attention module.

The package is laid out as the pipeline: ``load`` -> ``execute`` -> ``probe`` -> ``check``
-> ``score`` -> ``report``; ``assign`` makes student notebooks from a master notebook,
``sandbox`` isolates student code and ``cli`` ties it together.
"""

__version__ = "0.2.0"
