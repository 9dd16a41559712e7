"""The command lines of ``raystudy COMMAND``, a module per subcommand named as the subcommand.

Each is thin: it parses its flags (``cli``, the toolkit they share), checks them, and makes one
call into the layers below (``raystudy grid`` into ``raystudy.driver``, ``raystudy data`` into
``raystudy.data``, ...). The analysis commands (report, export, replay) are in
``analysis.commands``. Importing the package does nothing.
"""
