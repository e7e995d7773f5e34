module handler

go 1.16
