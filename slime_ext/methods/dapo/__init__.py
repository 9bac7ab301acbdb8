"""DAPO (DUET's baseline): clip-higher, dynamic sampling, overlong penalty."""
