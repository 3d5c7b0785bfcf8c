"""g2c-grader: grade notebook assignments of a deep-learning course.

The package is laid out as the pipeline: ``load`` -> ``execute`` -> ``graft`` -> ``probe`` ->
``check`` -> ``written`` -> ``score`` -> ``report``. Nothing in it names an assignment: each
one is content (``solutions/``, ``assignments/``), a rubric (``rubrics/``) and a package of
hidden checks (``checks/<name>/``); ``assign`` makes student notebooks from a master notebook,
``sandbox`` isolates student code and ``cli`` ties it together.
"""

__version__ = "0.3.0"
