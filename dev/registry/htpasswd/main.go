// htpasswd prints one bcrypt htpasswd line, `USER:$2a$...`, for the test registry's
// htpasswd auth (CNCF distribution accepts bcrypt entries only). Test infrastructure:
// built by dev/registry/registry.sh into $SANDHUB_CACHE/registry/bin.
//
//	htpasswd USER PASSWORD
package main

import (
	"fmt"
	"os"
	"strings"

	"golang.org/x/crypto/bcrypt"
)

func main() {
	if len(os.Args) != 3 || os.Args[1] == "" || strings.Contains(os.Args[1], ":") {
		fmt.Fprintln(os.Stderr, "usage: htpasswd USER PASSWORD (USER non-empty, without ':')")
		os.Exit(2)
	}
	hash, err := bcrypt.GenerateFromPassword([]byte(os.Args[2]), bcrypt.DefaultCost)
	if err != nil {
		fmt.Fprintln(os.Stderr, "htpasswd:", err)
		os.Exit(1)
	}
	fmt.Printf("%s:%s\n", os.Args[1], hash)
}
