"""The one error contract of every CLI (nmt/errors.py, nmt/cli.ends_in_one_line): a UserError is one line and exit
2, a Stopped job exit 75, Ctrl-C exit 130; anything else stays a traceback (a bug must show where it is)."""

import pytest

from nmt.checkpoints.checkpoint import CheckpointError
from nmt.cli import ends_in_one_line
from nmt.config import ConfigError
from nmt.data.readers import DataError
from nmt.errors import EXIT_STOPPED, EXIT_USER_ERROR, Stopped, UserError
from nmt.export import NotExportable
from nmt.train import TrainingStopped
from nmt.training.optim import Diverged


@pytest.mark.parametrize("error", [ConfigError, CheckpointError, DataError, NotExportable, Diverged])
def test_every_error_a_user_can_mend_is_one_line_and_exit_2(error, capsys):
    with pytest.raises(SystemExit) as stop, ends_in_one_line("train"):
        raise error("data.src_train: no such file data/x.en")
    assert stop.value.code == EXIT_USER_ERROR == 2
    assert capsys.readouterr().err == "error: data.src_train: no such file data/x.en\n"


def test_a_stopped_job_exits_75_and_ctrl_c_130_with_what_was_kept(capsys):
    assert issubclass(TrainingStopped, Stopped) and not issubclass(Stopped, UserError)
    with pytest.raises(SystemExit) as stop, ends_in_one_line("train"):
        raise TrainingStopped("saved at update 7")
    assert stop.value.code == EXIT_STOPPED == 75
    with pytest.raises(SystemExit) as stop, ends_in_one_line("average", interrupted="interrupted: nothing written"):
        raise KeyboardInterrupt
    assert stop.value.code == 130 and "interrupted: nothing written (Ctrl-C)" in capsys.readouterr().err


def test_a_bug_is_not_dressed_as_a_user_error():
    with pytest.raises(ZeroDivisionError), ends_in_one_line("train"):
        1 / 0
