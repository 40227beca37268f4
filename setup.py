"""The compiled part of memcpy-doctor: one optional C extension (the rest is in pyproject.toml).

Where it cannot be built (no C compiler), the install still succeeds and the tracer uses the
Python version of the same class (memcpy_doctor/tracer/producers.py), which is slower.
"""

from setuptools import Extension, setup

setup(ext_modules=[
    Extension("memcpy_doctor.tracer._producers", ["memcpy_doctor/tracer/_producers.c"],
              optional=True),
])
