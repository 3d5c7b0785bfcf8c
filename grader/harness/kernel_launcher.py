"""The notebook's kernel: ``python kernel_launcher.py -f CONNECTION_FILE``, started by
``run_notebook.py`` where Jupyter would run ``python -m ipykernel_launcher``.

It installs the probe's seccomp filter (``syscall_filter.py``) before ipykernel starts any
thread, so that student code cannot tell the notebook's run from the probe's grading run by
the filter: both show the same ``Seccomp`` lines in ``/proc/self/status`` and deny the same
calls. No process under the filter can run a program, so IPython's ways of running one
(``!cmd``, ``x = !cmd``, ``%pip``, ``%%bash`` and the other script cells) print a note that says
so, where they would fail with a PermissionError.
"""
import sys
from pathlib import Path

import syscall_filter  # copied next to this file

SKIPPED = ("[the grader runs no other programs: {what} was skipped. Packages come from the "
           "assignment's requirements; run shell commands on your own machine.]\n")
CANNOT_EXECUTE = 126   # the shell's exit status for a command it could not run


def skip_programs() -> None:
    """Replace IPython's ways of running a program with a note on the cell's stderr."""
    from IPython.core.interactiveshell import InteractiveShell
    from IPython.core.magics.script import ScriptMagics
    from IPython.utils.text import SList
    from ipykernel.zmqshell import ZMQInteractiveShell

    def system(shell, cmd):
        sys.stderr.write(SKIPPED.format(what=f"the command {cmd!r}"))
        shell.user_ns["_exit_code"] = CANNOT_EXECUTE

    def getoutput(shell, cmd, split=True, depth=0):
        system(shell, cmd)
        return SList() if split else ""

    def script_cell(magics, line, cell):
        sys.stderr.write(SKIPPED.format(what=f"this %%script cell ({line.strip() or 'no program'})"))

    for shell_class in (InteractiveShell, ZMQInteractiveShell):
        shell_class.system = shell_class.system_piped = shell_class.system_raw = system
        shell_class.getoutput = getoutput
    ScriptMagics.shebang = script_cell


def main() -> None:
    syscall_filter.install()
    # As ipykernel_launcher does: this script's folder is not the notebook's import path
    # (InteractiveShellApp adds the working folder back).
    if Path(sys.path[0]) == Path(__file__).resolve().parent:
        del sys.path[0]
    skip_programs()
    from ipykernel import kernelapp
    kernelapp.launch_new_instance()


if __name__ == "__main__":
    main()
