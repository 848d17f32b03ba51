"""The training side: the one training engine every trainer runs on (`engine`: loop, resumable state, packing, the
loss), the router training records and their readers (`records`) and the ranks of a ``torchrun`` job (`distributed`)."""
