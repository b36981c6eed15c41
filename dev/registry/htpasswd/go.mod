module sandhub.dev/registry-htpasswd

go 1.23.0

require golang.org/x/crypto v0.36.0
