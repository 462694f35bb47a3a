"""Pure parsers: captured command output in, frozen typed values out. No I/O here."""
