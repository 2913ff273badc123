"""What a kill leaves in a folder at each of its file events: the fault-injection tests'
snapshots (a kill -9 stops a process between two system calls, and every file is flushed
before it is renamed, so the folder as it is just before a rename, a replace, a tree
removal or a new directory is exactly what a kill at that instant leaves on the disk)."""

import contextlib
import os
import pathlib
import shutil


class CrashPoints:
    """Records a copy of `folder` just before each file event inside it (`os.replace`,
    `Path.rename`, `shutil.rmtree`, `Path.mkdir`) into `store/NNN`, with a label saying
    which event came next. `points` lists (label, copy) in order."""

    def __init__(self, folder, store):
        self.folder = pathlib.Path(folder).absolute()
        self.store = pathlib.Path(store)
        self.points = []

    def _inside(self, path):
        try:
            pathlib.Path(path).absolute().relative_to(self.folder)
            return True
        except ValueError:
            return False

    def snapshot(self, label):
        copy = self.store / f"{len(self.points):03d}"
        if self.folder.exists():
            shutil.copytree(self.folder, copy, symlinks=True)
        self.points.append((label, copy))

    @contextlib.contextmanager
    def recording(self, monkeypatch):
        """Snapshots while inside the `with` (the patches end with it)."""
        replace, rename = os.replace, pathlib.Path.rename
        rmtree, mkdir = shutil.rmtree, pathlib.Path.mkdir

        def name(path):
            return pathlib.Path(path).name

        def recorded_replace(src, dst, *args, **kwargs):
            if self._inside(dst):
                self.snapshot(f"replace {name(src)} -> {name(dst)}")
            return replace(src, dst, *args, **kwargs)

        def recorded_rename(self_path, target):
            if self._inside(target):
                self.snapshot(f"rename {self_path.name} -> {name(target)}")
            return rename(self_path, target)

        def recorded_rmtree(path, *args, **kwargs):
            if self._inside(path) and pathlib.Path(path).exists():
                self.snapshot(f"rmtree {name(path)}")
            return rmtree(path, *args, **kwargs)

        def recorded_mkdir(self_path, *args, **kwargs):
            if self._inside(self_path) and self_path != self.folder:
                self.snapshot(f"mkdir {self_path.name}")
            return mkdir(self_path, *args, **kwargs)

        with monkeypatch.context() as patch:
            patch.setattr(os, "replace", recorded_replace)
            patch.setattr(pathlib.Path, "rename", recorded_rename)
            patch.setattr(shutil, "rmtree", recorded_rmtree)
            patch.setattr(pathlib.Path, "mkdir", recorded_mkdir)
            yield self
        self.snapshot("the end")
