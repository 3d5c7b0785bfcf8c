"""A pytest plugin for the public test suite: run every public test once per notebook.

``G2C_CORPUS`` holds a JSON object {id: notebook path}. The suite's ``la`` fixture is
parametrized with each notebook's code, loaded by the suite's own ``load_notebook``, so one
pytest process runs the 15 public tests against the whole corpus.
"""
from __future__ import annotations

import json
import os


def pytest_generate_tests(metafunc):
    if "la" not in metafunc.fixturenames:
        return
    loader = next(p.load_notebook for p in metafunc.config.pluginmanager.get_plugins()
                  if hasattr(p, "load_notebook"))
    notebooks = json.loads(os.environ["G2C_CORPUS"])
    modules = [loader(path, module_name=f"la_{name}") for name, path in notebooks.items()]
    metafunc.parametrize("la", modules, ids=list(notebooks), scope="session")
