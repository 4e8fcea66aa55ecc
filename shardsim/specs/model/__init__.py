"""Models as specified: their shape (`Arch`), families, descriptions and readers."""
