"""The compiled part of memcpy-doctor: two optional C extensions (the rest is in pyproject.toml).

Where they cannot be built (no C compiler), the install still succeeds and the tracer uses the
Python versions of the same classes (memcpy_doctor/tracer/producers.py, and the simulated GPU's
memcpy_doctor/tracer/sim/marks.py), which are slower.
"""

from setuptools import Extension, setup

setup(ext_modules=[
    Extension("memcpy_doctor.tracer._producers", ["memcpy_doctor/tracer/_producers.c"],
              optional=True),
    Extension("memcpy_doctor.tracer.sim._marks", ["memcpy_doctor/tracer/sim/_marks.c"],
              optional=True),
])
