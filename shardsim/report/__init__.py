"""What a sweep shows people: its tables in the terminal (`tables`), its plots (`plots`) and its
HTML page (`html_page`). It reads a sweep's table (`shardsim.sweep`); the sweep never imports it.
Import a name from the module that holds it."""
