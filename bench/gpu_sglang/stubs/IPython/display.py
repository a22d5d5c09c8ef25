"""Stub (see IPython/__init__.py)."""


class HTML(str):
    pass


def display(*objs, **kw):
    print(*objs)
