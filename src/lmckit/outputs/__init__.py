"""Where results may be written: the one output policy of every writer, library and CLI alike.

Every writer (``lmckit.save``, ``lmckit.save_model``, the Hugging Face writer, plots, every
command) checks its outputs here *before* it writes, and every command also before it
computes anything:

* an output may not be, contain, or lie inside one of the command's inputs (checkpoints,
  data files and folders), whatever ``force`` says;
* the current working directory, the home folder and their ancestors are never an
  output folder, whatever ``force`` says;
* an output folder that exists must be empty or an lmckit output of the same kind
  (a checkpoint written by lmckit holding only the files lmckit writes, a Hugging Face
  folder whose ``lmckit.json`` lists every entry, an experiment folder carrying
  lmckit's run marker, or a curve folder whose marker lists every entry); a subfolder
  such an output may hold (``reference/``, a curve's points) must itself be lmckit's,
  and every listed entry must be the regular file it claims to be;
  anything else is refused unless ``force`` is given (``--force`` on the command line,
  ``overwrite=True`` in Python); an experiment folder, which is filled in place, may
  not be or hold a symbolic link (lmckit never writes through one);
* an output file (``--json``, ``--plot``, a module's weights) replaces only a regular
  file, and only one lmckit wrote (:mod:`lmckit.outputs._own_files`) unless ``force`` is given;
  a symbolic link is replaced (the link itself, never what it points to) only with
  ``force``; a folder, a device, a FIFO or a socket never; nor is a file written inside
  a model folder (``config.json`` beside weights), which lmckit would corrupt;
* two outputs of one command never share a path, nor lie one inside the other;
* the place must be writable: a probe file is created and removed in the nearest
  existing ancestor.

The writes themselves are atomic (:mod:`lmckit.outputs._atomic`); this module decides whether a
write is allowed at all.
"""

from typing import TYPE_CHECKING

from lmckit._lazy import lazy_exports

if TYPE_CHECKING:
    from lmckit.outputs._files import check_output_file
    from lmckit.outputs._folders import OutputKind, check_output_dir
    from lmckit.outputs._places import OutputError

__getattr__, __dir__, __all__ = lazy_exports(__name__, __file__)
