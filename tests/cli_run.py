"""Running the command line in-process from tests, and the check that it refused an input cleanly."""
from comet_dse.cli import main


def run(capsys, *argv):
    """(exit status, stdout, stderr) of the CLI run in-process; argparse errors raise SystemExit."""
    try:
        code = main([str(a) for a in argv])
    except SystemExit as exc:
        code = exc.code
    out, err = capsys.readouterr()
    return code, out, err


def one_line_error(result, *needles, status: int = 2) -> str:
    """Of a ``run`` result: exit ``status`` (2: bad input, 1: the machine), nothing on stdout, and on stderr
    one ``comet-dse: error:`` line holding every needle and nothing else (no traceback); returns the line."""
    code, out, err = result
    assert code == status, (code, out, err)
    assert out == "", out
    lines = err.splitlines()
    assert len(lines) == 1 and err.endswith("\n") and lines[0].startswith("comet-dse: error: "), err
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    return lines[0]
