"""A minimal raybench encoder plugin (see README.md): the adapter is my_encoder.adapter."""
