"""The one compiled part: a rank started with vfork + exec (nodeagent/supervisor/_rankexec.c, why: there).

Everything else is in pyproject.toml. The extension is optional: where it does not build (no compiler, no
Python headers), the install goes on and the supervisor forks its ranks in Python, as it did before.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "garrison.nodeagent.supervisor._rankexec",
            sources=["nodeagent/supervisor/_rankexec.c"],
            extra_compile_args=["-std=gnu11", "-O2", "-Wall", "-Wextra", "-Wno-unused-parameter"],
            optional=True,
        )
    ]
)
