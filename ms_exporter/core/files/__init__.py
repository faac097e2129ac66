"""Files in save_dir the monitor owns: opened without following a link, written through temporaries, locked per rank."""
