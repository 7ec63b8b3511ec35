"""What pyproject.toml cannot say: the studies (``pipelines/``) and the examples
(``examples/``) stay at the repository's root, and the wheel carries them inside the
package, under ``capsmed/_bundled/``, so that an installed capsmed runs a study by name
(``capsmed run smoke``). An editable install reads them from the root instead
(``capsmed/bundled.py``)."""

from setuptools import find_packages, setup

BUNDLED = {"capsmed._bundled.pipelines": "pipelines", "capsmed._bundled.examples": "examples"}

setup(
    packages=[*find_packages(include=["capsmed*"]), *BUNDLED],
    package_dir=BUNDLED,
    package_data={"capsmed": ["py.typed"], "capsmed._bundled.pipelines": ["*.yaml"],
                  "capsmed._bundled.examples": ["*.yaml", "*.py"]},
)
