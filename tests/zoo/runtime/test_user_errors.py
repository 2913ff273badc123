"""`zoo.runtime.user_errors`: a user's error is one line and exit status 2, a bug keeps its
traceback, and output paths are checked before the work."""

import errno

import pytest

from zoo.errors import ConfigError, UserError
from zoo.runtime import user_errors


def test_a_user_error_or_an_os_error_is_one_line_and_exit_2(capsys):
    @user_errors.one_line_errors("tool")
    def main(err):
        raise err

    assert main(ConfigError("bad\nvalue")) == 2
    assert capsys.readouterr().err == "tool: error: bad; value\n"
    assert main(OSError(errno.ENOSPC, "No space left on device", "/d/q.npy")) == 2
    assert capsys.readouterr().err == ("tool: error: /d/q.npy: No space left on device (the "
                                       "disk is full; free space and run the command "
                                       "again)\n")
    assert main(PermissionError(errno.EACCES, "Permission denied", "/r", None, "/s")) == 2
    assert "tool: error: /r -> /s: Permission denied (permission denied; choose a place" in \
        capsys.readouterr().err
    with pytest.raises(ZeroDivisionError):  # a bug is not the user's: its traceback stays
        main(ZeroDivisionError("x"))


def test_output_paths_are_checked_before_the_work(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    user_errors.check_output_dir(tmp_path / "new" / "deeper", "--out")  # can be made
    user_errors.check_output_file(tmp_path / "r.json", "--json")
    user_errors.check_output_file(tmp_path / "new" / "r.json", "--json", make_folders=True)
    cases = [
        (lambda: user_errors.check_output_dir(blocker, "--out"), "a file is there"),
        (lambda: user_errors.check_output_dir(blocker / "run", "--out"),
         f"{blocker} is a file, not a folder"),
        (lambda: user_errors.check_output_file(tmp_path, "--json"), "it is a folder"),
        (lambda: user_errors.check_output_file(tmp_path / "no" / "r.json", "--json"),
         "there is no folder"),
        (lambda: user_errors.check_output_file(blocker / "r.json", "--json",
                                               make_folders=True), "is a file, not a folder"),
    ]
    for check, message in cases:
        with pytest.raises(UserError, match=message):
            check()
