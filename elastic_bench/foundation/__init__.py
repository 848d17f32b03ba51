"""The foundation every other part stands on, importing nothing of the project: a name registry with "did you mean"
errors (`registry`), atomic writes, digests and the output-folder lock (`files`), config dataclasses turned into
command-line options and checked values (`options`), and the record that declares a command (`commands`)."""
