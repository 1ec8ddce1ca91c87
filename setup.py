"""Packaging hook: pyproject.toml holds the metadata. The wheel also carries the project's Ansible tree
(ansible.cfg, site.yml, playbooks/, roles/) as rlrun/_ansible, so an rlrun installed from it reads the cluster
contract and runs the playbooks without a checkout (rlrun/contract.py looks there when there is no checkout
around rlrun/). An editable install reads the checkout itself."""

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent
TREE = ("ansible.cfg", "site.yml", "playbooks", "roles")


class BuildPyWithAnsible(build_py):
    def run(self):
        super().run()
        if getattr(self, "editable_mode", False):
            return
        missing = [name for name in TREE if not (HERE / name).exists()]
        if missing:
            raise SystemExit(f"setup.py: {', '.join(missing)} missing beside setup.py: the wheel must carry the "
                             "Ansible tree rlrun reads (build from a checkout or the sdist)")
        target = Path(self.build_lib) / "rlrun" / "_ansible"
        shutil.rmtree(target, ignore_errors=True)
        ignore = shutil.ignore_patterns("__pycache__", "*.pyc", ".secrets", "*.retry")
        for name in TREE:
            if (HERE / name).is_dir():
                shutil.copytree(HERE / name, target / name, ignore=ignore)
            else:
                target.mkdir(parents=True, exist_ok=True)
                shutil.copy2(HERE / name, target / name)


setup(cmdclass={"build_py": BuildPyWithAnsible})
