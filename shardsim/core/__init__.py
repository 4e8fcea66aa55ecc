"""What both halves share: errors, files and locks, strict readers, units, flag types, console output."""
