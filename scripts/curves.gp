# Training curves from fashion_mnist's --log CSV: gnuplot -e "csv='in.csv'; png='out.png'" curves.gp
set terminal pngcairo size 1000,420 font ",10"
set output png
set datafile separator ","
set key autotitle columnhead
set multiplot layout 1,2 title "kdist Fashion-MNIST"
set xlabel "epoch"
set ylabel "mean training loss"
set grid
plot csv using 1:2 with linespoints lw 2 title "loss"
set ylabel "accuracy (%)"
set key bottom right
plot csv using 1:($3*100) with linespoints lw 2 title "train", \
     csv using 1:($4*100) with linespoints lw 2 title "test"
unset multiplot
