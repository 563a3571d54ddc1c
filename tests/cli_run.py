"""Running the command line in-process from tests."""
from comet_dse.cli import main


def run(capsys, *argv):
    """(exit status, stdout, stderr) of the CLI run in-process; argparse errors raise SystemExit."""
    try:
        code = main([str(a) for a in argv])
    except SystemExit as exc:
        code = exc.code
    out, err = capsys.readouterr()
    return code, out, err
