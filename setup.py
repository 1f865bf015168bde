"""The provider's optional C extension; everything else about the build is in pyproject.toml.

``_event_frames`` walks a segment read's event headers in C (protocol/event_frames.py). It is
optional: where no C compiler is found, the install goes on without it and the same walk runs in
Python."""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "airflow_provider_pravega.protocol._event_frames",
            ["airflow_provider_pravega/protocol/_event_frames.c"],
            optional=True,
        )
    ]
)
